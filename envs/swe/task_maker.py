"""SWE tasks without a hub: inject bugs into a real project, keep those its tests catch.

    make_tasks(MakerConfig(source="pypi:toolz==0.12.1", max_tasks=12)) -> [instance dicts]

The project's test suite runs twice in a sandbox for the baseline (only tests passing
both times count); then mutations (envs.swe.mutations) are tried one at a time, each
run time-limited. A mutation becomes a task when it breaks at least one baseline test
without making any disappear (no import/collection errors), and the task's own test
command (only the test files holding a broken test) shows every broken test failing on
the buggy tree and every selected test passing on the original one: the gold patch,
the reversal, provably fixes the task.

The problem statement is written from the failing run's output only (test names,
assertion messages, traceback locations); the mutation's description and the diff
never reach it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import random
import re
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from .log_parsers import PASSING, get_parser
from .mutations import OPERATORS, Mutation, mutations
from .task_source import (MakerError, Source, discover_sources, discover_tests, fetch_source, git_snapshot,
                          gold_patch)

IMAGE_REPO = "roll-agent-swe"  # per-task images: roll-agent-swe:<instance_id>
WORKDIR = "/testbed"
PYTEST = "python3 -m pytest -rA --tb=short -p no:cacheprovider"
CREATED_AT = "2000-01-01T00:00:00Z"  # the snapshot date; the tasks are synthetic
_MAX_LOG = 8_000_000  # -rA summaries of big suites are long; the parser needs them whole


@dataclasses.dataclass
class MakerConfig:
    source: str  # "pypi:NAME==VERSION" or a local directory
    max_tasks: int = 10
    seed: int = 0
    max_candidates: int | None = None  # mutations tried; None: 6 x max_tasks
    tests: tuple[str, ...] = ()  # test files/globs relative to the project root; () = discovered
    src: tuple[str, ...] = ()  # files/globs to mutate; () = the non-test .py files
    operators: tuple[str, ...] = ()  # () = all of mutations.OPERATORS
    max_fail: int = 40  # a mutation breaking more tests than this is too blunt to be a task
    sandbox: str = "bwrap"  # "bwrap" (root="base") or "docker" (the base image)
    test_timeout: float | None = None  # per run; None: 10 x the slower baseline run + 30 s
    pythonpath: str = ""  # e.g. "src" for src layouts; set in front of the test command
    sha256: str | None = None  # expected sdist hash (pypi sources)
    cache: str | None = None  # sdist cache; default <ROLL_AGENT_CACHE>/swe-sdists
    log: Callable[[str], None] = print

    def __post_init__(self):
        self.tests, self.src, self.operators = tuple(self.tests), tuple(self.src), tuple(self.operators)
        bad = set(self.operators) - set(OPERATORS)
        if bad:
            raise ValueError(f"unknown mutation operators {sorted(bad)}; valid: {sorted(OPERATORS)}")
        if self.sandbox not in ("bwrap", "docker"):
            raise ValueError(f"sandbox must be 'bwrap' or 'docker', got {self.sandbox!r}")
        if self.max_tasks < 1:
            raise ValueError(f"max_tasks must be >= 1, got {self.max_tasks}")


def test_command(files: list[str], pythonpath: str = "") -> str:
    env = f"PYTHONPATH={pythonpath} " if pythonpath else ""
    return f"{env}{PYTEST} {' '.join(files)}"


def _sandbox(kind: str):
    from sandboxes import make_sandbox

    # one core: the maker shares the machine; bytecode off: a mutated file of the same
    # size written within the same second would otherwise run from a stale .pyc
    opts = dict(workdir=WORKDIR, memory_mb=2048, cpus=1.0, max_output_bytes=_MAX_LOG,
                env={"PYTHONDONTWRITEBYTECODE": "1"})
    if kind == "bwrap":
        return make_sandbox("bwrap", root="base", **opts)
    return make_sandbox("docker", **opts)


class _Runner:
    """Runs test commands on a project tree in one sandbox; files are swapped in place."""

    def __init__(self, sb, parse):
        self.sb, self.parse = sb, parse

    def run(self, cmd: str, timeout: float) -> tuple[dict[str, str] | None, str, float]:
        r = self.sb.exec(cmd, timeout=timeout)
        return (None if r.timed_out else self.parse(r.output)), r.output, r.duration_s

    def write(self, path: str, text: str) -> None:
        self.sb.write_file(f"{WORKDIR}/{path}", text)


def _passing(results: dict[str, str]) -> set[str]:
    # ids with whitespace cannot be told apart from the " - message" of a FAILED line
    return {t for t, s in results.items() if s in PASSING and not re.search(r"\s", t)}


def _file_of(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def _candidates(source: Source, files: list[str], cfg: MakerConfig) -> list[Mutation]:
    """Seeded mutations over all files, interleaved by operator so no one kind dominates."""
    by_op: dict[str, list[Mutation]] = defaultdict(list)
    for f in files:
        text = (source.root / f).read_text(encoding="utf-8")
        try:
            found = mutations(text, f, seed=cfg.seed, operators=cfg.operators or None)
        except SyntaxError:
            continue  # e.g. a py2-only helper shipped in the sdist
        for m in found:
            by_op[m.operator].append(m)
    rng = random.Random(cfg.seed)
    for ms in by_op.values():
        rng.shuffle(ms)  # mix files within an operator
    order = sorted(by_op)
    out, i = [], 0
    while any(by_op[o] for o in order):
        o = order[i % len(order)]
        if by_op[o]:
            out.append(by_op[o].pop())
        i += 1
    return out[: cfg.max_candidates or 6 * cfg.max_tasks]


def _failure_sections(log: str) -> dict[str, str]:
    """pytest's `--tb=short` failure sections by test title ("test_x", "Class.test_y")."""
    m = re.search(r"^=+ FAILURES =+$(.*?)^=+ \S.* =+$", log, re.M | re.S)
    if not m:
        return {}
    parts = re.split(r"^_{3,} (.+?) _{3,}$", m.group(1), flags=re.M)
    return {parts[i].strip(): parts[i + 1].strip("\n") for i in range(1, len(parts) - 1, 2)}


def _trim_traceback(section: str, test_files: set[str], max_lines: int = 30) -> str:
    """Keep frame locations and the E lines; code lines only from test files.

    A bug report carries a traceback, but the library lines of it would point straight
    at the injected edit, which a real reporter's would not single out either.
    """
    out, in_test_frame = [], False
    for line in section.splitlines():
        loc = re.match(r"^(\S+?\.py):\d+: in ", line)
        if loc:
            in_test_frame = loc.group(1) in test_files
            out.append(line)
        elif line.startswith("E ") or line.startswith("E\t") or in_test_frame:
            out.append(line)
    # object addresses differ run to run; the statement must not (reproducible task sets)
    out = _collapse_repeats([re.sub(r"\b0x[0-9a-f]{6,}\b", "0x...", line) for line in out])
    if len(out) > max_lines:
        out = out[: max_lines // 2] + ["..."] + out[-(max_lines // 2):]
    return "\n".join(out)


def _collapse_repeats(lines: list[str]) -> list[str]:
    """Runs of one line (a recursion's frames) become the line and a count."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        j = i
        while j + 1 < len(lines) and lines[j + 1] == lines[i]:
            j += 1
        out.append(lines[i])
        if j - i >= 2:
            out.append(f"[... the line above repeats {j - i} more times ...]")
        elif j > i:
            out.append(lines[i])
        i = j + 1
    return out


def problem_statement(source: Source, cmd: str, failing: list[str], log: str, test_files: list[str]) -> str:
    sections = _failure_sections(log)
    shown = []
    for t in failing[:3]:
        title = t.split("::", 1)[1].replace("::", ".") if "::" in t else t
        if title in sections:
            shown.append(f"{t}\n{_trim_traceback(sections[title], set(test_files))}")
    listed = "\n".join(f"- {t}" for t in failing[:15]) + (f"\n- ... and {len(failing) - 15} more"
                                                           if len(failing) > 15 else "")
    what = f"{source.name} {source.version}" if source.version != "local" else source.name
    text = (f"Some tests of {what} fail. Running\n\n    {cmd}\n\nin the repository gives {len(failing)} failing "
            f"test(s):\n\n{listed}\n")
    if shown:
        text += "\nFailure output (shortened):\n\n```\n" + "\n\n".join(shown) + "\n```\n"
    return text + ("\nThe tests are correct: fix the library code so that they pass, without "
                   "breaking the other tests.\n")


@dataclasses.dataclass
class _Found:
    mutation: Mutation
    failing: list[str]
    passing: list[str]
    test_files: list[str]
    cmd: str
    log: str


def _baseline(runner: _Runner, cmd: str, cfg: MakerConfig) -> tuple[set[str], float]:
    """Tests passing in two runs (flaky ones are left out), and the per-run time limit."""
    limit = cfg.test_timeout or 600.0
    runs = [runner.run(cmd, limit) for _ in range(2)]
    if any(results is None for results, _, _ in runs):
        raise MakerError(f"the baseline test run took longer than {limit:.0f}s; pass --tests with faster files")
    passing = _passing(runs[0][0]) & _passing(runs[1][0])
    if not passing:
        raise MakerError(f"no test passes at baseline with `{cmd}`; log tail:\n{runs[0][1][-2000:]}")
    # generous: the limit is there for mutations that hang, and a busy machine must not
    # turn a slow-but-finishing run into a timeout (the task set would depend on load)
    return passing, cfg.test_timeout or 10 * max(d for _, _, d in runs) + 30


def _screen(runner: _Runner, m: Mutation, full_cmd: str, baseline: set[str], timeout: float,
            cfg: MakerConfig) -> tuple[_Found | None, str]:
    """(the task, "kept") or (None, why not); the original file is always restored."""
    runner.write(m.path, m.mutated)
    try:
        results, _, _ = runner.run(full_cmd, timeout)
        if results is None:
            return None, "timed out"
        if baseline - results.keys():
            return None, "tests vanished (import or collection error)"
        broken = sorted(t for t in baseline if results[t] not in PASSING)
        if not broken:
            return None, "no test broke"
        if len(broken) > cfg.max_fail:
            return None, f"{len(broken)} tests broke (> max_fail)"
        files = sorted({_file_of(t) for t in broken})
        cmd = test_command(files, cfg.pythonpath)
        selected = {t for t in baseline if _file_of(t) in files}
        scoped, log, _ = runner.run(cmd, timeout)
        if scoped is None or any(scoped.get(t) in PASSING for t in broken) or \
                any(scoped.get(t) not in PASSING for t in selected - set(broken)):
            return None, "the scoped test run disagrees with the full one"
        return _Found(m, broken, sorted(selected - set(broken)), files, cmd, log), "kept"
    finally:
        runner.write(m.path, m.source)


def _instance(source: Source, found: _Found, tmp: Path) -> dict[str, Any]:
    """The SWE-bench-schema record; builds the buggy repo once for its commit and gold patch."""
    tree = tmp / "task"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(source.root, tree, symlinks=True)
    m = found.mutation
    (tree / m.path).write_text(m.mutated, encoding="utf-8")
    commit = git_snapshot(tree)
    patch = gold_patch(tree, m.path, m.source)
    digest = hashlib.sha256(f"{source.spec}\n{source.sha256}\n{patch}".encode()).hexdigest()[:10]
    iid = f"{source.name}-{source.version}__{digest}" if source.version != "local" else f"{source.name}__{digest}"
    return {
        "instance_id": iid, "repo": f"{'pypi' if source.sha256 else 'local'}/{source.name}",
        "base_commit": commit, "patch": patch, "test_patch": "",
        "problem_statement": problem_statement(source, found.cmd, found.failing, found.log, found.test_files),
        "hints_text": "", "created_at": CREATED_AT, "version": source.version,
        "environment_setup_commit": commit, "FAIL_TO_PASS": found.failing, "PASS_TO_PASS": found.passing,
        "image": f"{IMAGE_REPO}:{iid}", "workdir": WORKDIR, "test_cmd": found.cmd, "log_parser": "pytest",
        "source": source.spec, "source_sha256": source.sha256,
    }


def make_tasks(cfg: MakerConfig) -> list[dict[str, Any]]:
    """Up to cfg.max_tasks verified task instances from cfg.source (see the module doc)."""
    with tempfile.TemporaryDirectory(prefix="swe-maker-") as tmp_name:
        tmp = Path(tmp_name)
        source = fetch_source(cfg.source, tmp, cfg.cache, cfg.sha256)
        tests = discover_tests(source.root, cfg.tests)
        candidates = _candidates(source, discover_sources(source.root, tests, cfg.src), cfg)
        cfg.log(f"{source.spec}: {len(tests)} test files, {len(candidates)} candidate mutations")
        full_cmd = test_command(tests, cfg.pythonpath)
        found: list[_Found] = []
        clean: dict[tuple[str, ...], bool] = {}
        t0 = time.monotonic()
        with _sandbox(cfg.sandbox) as sb:
            sb.upload(str(source.root), WORKDIR)
            runner = _Runner(sb, get_parser("pytest"))
            baseline, timeout = _baseline(runner, full_cmd, cfg)
            cfg.log(f"baseline: {len(baseline)} passing tests; per-run limit {timeout:.0f}s")
            tried, t_loop = 0, time.monotonic()
            for m in candidates:
                if len(found) >= cfg.max_tasks:
                    break
                tried += 1
                task, why = _screen(runner, m, full_cmd, baseline, timeout, cfg)
                if task is not None and tuple(task.test_files) not in clean:
                    # the gold side: every selected test passes on the original tree
                    results, _, _ = runner.run(task.cmd, timeout)
                    clean[tuple(task.test_files)] = results is not None and all(
                        results.get(t) in PASSING for t in task.failing + task.passing)
                if task is not None and not clean[tuple(task.test_files)]:
                    task, why = None, "the original tree fails the scoped tests"
                if task is not None:
                    found.append(task)
                cfg.log(f"[{tried}/{len(candidates)}] {m.description}: {why} | "
                        f"{progress(tried, len(candidates), len(found), cfg.max_tasks, time.monotonic() - t_loop)}")
        cfg.log(f"{len(found)} tasks from {tried} mutations in {time.monotonic() - t0:.0f}s")
        instances, seen = [], set()
        for task in found:
            inst = _instance(source, task, tmp)
            if inst["instance_id"] not in seen:
                seen.add(inst["instance_id"])
                instances.append(inst)
        return instances


def progress(tried: int, candidates: int, found: int, wanted: int, elapsed: float) -> str:
    """Tasks so far, the rate and an ETA: the run ends at `wanted` tasks or when the candidates
    run out, whichever comes first at the yield so far."""
    per = elapsed / max(tried, 1)
    left = candidates - tried
    if found:
        left = min(left, round((wanted - found) * tried / found))
    return f"{found}/{wanted} tasks, {60 / per if per else 0:.1f} mutations/min, ETA {duration(max(left, 0) * per)}"


def duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"
