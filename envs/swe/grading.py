"""Grade a model patch on a SWE instance in a fresh sandbox.

    from envs.swe.grading import grade
    r = grade(instance, model_patch, sandbox="docker", timeout=600)
    r.status  # "resolved" | "unresolved" | "error" | "empty_patch";  r.reason says why for errors

Steps, execs in the sandbox (each command and its output go to `r.log`; 1 and the first
try of 2 are one command, as most patches take the first way):
  1. check out base_commit (a no-op in images that are already there);
  2. apply the model patch: `git apply`, else `git apply --3way`, else `patch --fuzz=5`
     (`r.apply_method` says which one took it); none, but its reverse applies: the change is
     in the tree already ("already applied", as the official harness counts it: the tests
     decide); else error "patch does not apply";
  3. restore the files test_patch touches to base_commit (a model may not edit the
     tests that judge it), apply test_patch;
  4. run test_cmd (default: pytest -rA on the files the test ids name), parse its log
     with the instance's log_parser. With fail_fast (the default, pytest instances,
     not partial credit) pytest stops at the first FAIL_TO_PASS/PASS_TO_PASS test that
     fails (stop_plugin.py): that test already makes the verdict "unresolved", and
     tests run in the same order as in a full run, so the verdict is the same, at a
     fraction of the cost for most wrong patches (`r.stopped_at` names the test,
     `r.not_run` lists the verdict tests it did not reach: not in the failure lists).
An instance with an `eval_script` (SWE-bench 5.x) runs it as the official harness does
in place of 3 and 4 (`bash eval.sh`: it resets the test files, applies test_patch and
runs the tests), and only what it prints between ">>>>> Start Test Output" and
">>>>> End Test Output" is parsed (all of it when that part names no test); a script
that prints no markers, like a log that names no test, grades "unresolved", as in the harness.
Verdict, as the official harness (swebench 5.x) decides it: resolved iff every
FAIL_TO_PASS test passes (PASSED or XFAIL; a test missing from the log has not passed)
and every PASS_TO_PASS test passes or is skipped; a test id cut short inside its
`[params]` matches the ids it starts when they agree. eval_type "fail_only": a verdict
test passes unless the log says FAILED. Reward 1/0, or with partial_credit the
fraction of those tests that pass. Errors (malformed instance, patch does not apply,
sandbox died, timeout) get reward 0 and are never raised: one instance's trouble ends
only that instance.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
import time
from pathlib import Path
from typing import Any

from sandboxes import Sandbox, SandboxError

from .instance import InstanceError, SWEInstance
from .log_parsers import FAILED, OFFICIAL_PREFIX, PASSING, PYTEST_PARSERS, SKIPPED, get_parser
from .stop_plugin import LOADED, STOPPED
from .sources import prepare_sandbox

RESOLVED, UNRESOLVED, ERROR, EMPTY_PATCH = "resolved", "unresolved", "error", "empty_patch"
STATUSES = (RESOLVED, UNRESOLVED, ERROR, EMPTY_PATCH)
STEP_TIMEOUT = 120.0  # seconds for each git/patch step (the test run gets `timeout`)
INLINE_MAX = 96 * 1024  # bytes; one environment string may hold 128 KiB (MAX_ARG_STRLEN)
MODEL_PATCH = "/tmp/roll_agent_model.patch"
TEST_PATCH = "/tmp/roll_agent_test.patch"
EVAL_SCRIPT = "/tmp/roll_agent_eval.sh"
START_TEST_OUTPUT, END_TEST_OUTPUT = ">>>>> Start Test Output", ">>>>> End Test Output"  # the harness's markers
STOP_DIR = "/tmp/roll_agent_pytest"  # the stop plugin (module roll_agent_stop) and the verdict test ids
STOP_PLUGIN_SOURCE = (Path(__file__).parent / "stop_plugin.py").read_text()
# PYTEST_ADDOPTS reaches every pytest the test command starts, whatever its shape; the
# plugin takes these entries out again (stop_plugin._unwrap) before any test runs
STOP_ENV = (f'export ROLL_AGENT_STOP_IDS={STOP_DIR}/ids.txt '
            f'PYTEST_ADDOPTS="-p roll_agent_stop${{PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}}" '
            f'PYTHONPATH="{STOP_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"; ')

ALREADY_APPLIED = "already applied"  # apply_method when no method applies the patch but its reverse does
# (name, command) tried in order; a failed --3way that left conflicts is undone before the next
APPLY_METHODS = (
    ("git apply", f"git apply --verbose {MODEL_PATCH}"),
    ("git apply --3way", f"git apply --verbose --3way {MODEL_PATCH} || "
                         "{ rc=$?; [ -z \"$(git ls-files -u)\" ] || git reset -q --hard HEAD; exit $rc; }"),
    # --forward: in --batch mode patch would otherwise apply a "reversed" patch backwards
    ("patch --fuzz", f"patch --batch --forward --fuzz=5 -p1 --dry-run -i {MODEL_PATCH} && "
                     f"patch --batch --forward --fuzz=5 -p1 --no-backup-if-mismatch -r - -i {MODEL_PATCH}"),
)
CHECKOUT_FAILED = 97  # the exit code of the first command when base_commit cannot be checked out
_CHECKOUT = ('git update-index -q --refresh >/dev/null 2>&1; '
             'want=$(git rev-parse -q --verify "$BASE_COMMIT^{commit}") || '
             f'{{ echo "base_commit $BASE_COMMIT is not in the repository at $PWD"; exit {CHECKOUT_FAILED}; }}; '
             '[ "$(git rev-parse HEAD)" = "$want" ] || git -c advice.detachedHead=false checkout -q -f "$want" || '
             f'exit {CHECKOUT_FAILED}')


@dataclasses.dataclass
class GradeResult:
    instance_id: str
    status: str
    reward: float = 0.0
    reason: str = ""  # why, for "error" (and "empty_patch")
    apply_method: str = ""  # which fallback applied the model patch
    stopped_at: str = ""  # fail_fast: the failing FAIL_TO_PASS/PASS_TO_PASS test the run stopped at
    not_run: list[str] = dataclasses.field(default_factory=list)  # verdict tests after stopped_at
    tests: dict[str, str] = dataclasses.field(default_factory=dict)  # every test the log names -> status
    fail_to_pass: dict[str, list[str]] = dataclasses.field(default_factory=lambda: {"success": [], "failure": []})
    pass_to_pass: dict[str, list[str]] = dataclasses.field(default_factory=lambda: {"success": [], "failure": []})
    log: str = ""  # each step: its command, output and exit code
    test_output: str = ""  # what test_cmd printed (the parser's input)
    duration_s: float = 0.0

    @property
    def resolved(self) -> bool:
        return self.status == RESOLVED

    def to_dict(self, logs: bool = False) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if not logs:
            d.pop("log"), d.pop("test_output")
        return d


def instance_problem(instance: SWEInstance, backend: str | None) -> str | None:
    """Why `instance` cannot be graded at all (a malformed instance), or None."""
    if not instance.FAIL_TO_PASS and not instance.PASS_TO_PASS:
        return "no FAIL_TO_PASS or PASS_TO_PASS tests: nothing decides the verdict"
    try:
        get_parser(instance.log_parser, instance)
    except ValueError as e:
        return str(e)
    if instance.test_cmd is None and instance.eval_script is None and instance.log_parser not in PYTEST_PARSERS:
        return (f"no test_cmd or eval_script (only pytest parsers have a default command; "
                f"log_parser={instance.log_parser!r})")
    if backend == "docker" and not instance.image:
        return "no 'image' for the docker sandbox (build one: python -m sandboxes.build_image --task REPO_DIR)"
    return None


def default_test_cmd(instance: SWEInstance) -> str:
    """pytest -rA on the files the test ids name (SWE-bench instances carry no command)."""
    files = dict.fromkeys(t.split("::", 1)[0] for t in instance.tests)
    return "python3 -m pytest -rA -p no:cacheprovider " + " ".join(shlex.quote(f) for f in files)


def harness_eval_script(instance: SWEInstance) -> str:
    """The eval.sh the official harness (SWE-bench 5.x `eval_script`) runs for an instance that
    has test_patch and test_cmd instead: test files reset, test_patch applied, tests between markers."""
    wd, base = shlex.quote(instance.workdir), shlex.quote(instance.base_commit or "HEAD")
    lines = ["#!/bin/bash", "set -uxo pipefail", f"cd {wd}", f"git config --global --add safe.directory {wd}"]
    if instance.test_patch.strip():
        files = " ".join(shlex.quote(f) for f in patch_files(instance.test_patch))
        heredoc = "EOF_ROLL_AGENT_TEST_PATCH"
        lines += [f"for f in {files}; do git checkout -q {base} -- \"$f\" 2>/dev/null || rm -rf -- \"$f\"; done",
                  f"git apply -v - <<'{heredoc}'\n{instance.test_patch.rstrip(chr(10))}\n{heredoc}"]
    lines += [f": '{START_TEST_OUTPUT}'", instance.test_cmd or default_test_cmd(instance), f": '{END_TEST_OUTPUT}'"]
    return "\n".join(lines) + "\n"


def harness_row(instance: SWEInstance) -> dict[str, Any]:
    """The instance as an SWE-bench 5.x row, as the official harness runs it: its eval_script
    (written from test_patch and test_cmd when it has none) and an official parser name."""
    parser = {"pytest": "parse_log_pytest"}.get(instance.log_parser, instance.log_parser)
    if not parser.startswith(OFFICIAL_PREFIX):
        raise ValueError(f"log_parser {instance.log_parser!r} has no counterpart in the official harness")
    row = {k: v for k, v in instance.to_dict().items() if k != "test_cmd"}
    row.update(repo=instance.repo or "local/repo", version=instance.version or "0", log_parser=parser,
               eval_script=instance.eval_script or harness_eval_script(instance), eval_type=instance.eval_type)
    return row


def patch_files(diff: str) -> list[str]:
    """Paths a unified diff touches (both sides of renames), in order."""
    paths = re.findall(r"^(?:---|\+\+\+) (?:[ab]/)?(\S+)", diff, re.M)
    return list(dict.fromkeys(p for p in paths if p != "/dev/null"))


def status_of(test_id: str, tests: dict[str, str]) -> str | None:
    """What the log says of `test_id`. An id cut short inside its `[params]` (SWE-bench data
    has such ids) stands for the ids it starts, when they all pass or all fail (the harness's rule)."""
    if test_id in tests or test_id.count("[") <= test_id.count("]"):
        return tests.get(test_id)
    matches = [status for t, status in tests.items() if t.startswith(test_id)]
    return matches[0] if matches and len({s in PASSING for s in matches}) == 1 else None


def verdict(instance: SWEInstance, tests: dict[str, str], partial_credit: bool) -> tuple[str, float, dict, dict]:
    def passes(test_id: str, maintained: bool) -> bool:
        if instance.eval_type == "fail_only":
            return tests.get(test_id) != FAILED
        status = status_of(test_id, tests)
        return status in PASSING or (maintained and status == SKIPPED)  # a skipped P2P test is no regression

    def split(ids, maintained):
        ok = [passes(t, maintained) for t in ids]
        return {"success": [t for t, y in zip(ids, ok) if y], "failure": [t for t, y in zip(ids, ok) if not y]}

    f2p, p2p = split(instance.FAIL_TO_PASS, False), split(instance.PASS_TO_PASS, True)
    resolved = not f2p["failure"] and not p2p["failure"]
    passed = len(f2p["success"]) + len(p2p["success"])
    reward = 1.0 if resolved else (passed / len(instance.tests) if partial_credit else 0.0)
    return (RESOLVED if resolved else UNRESOLVED), reward, f2p, p2p


class _Run:
    """One grading: the sandbox, the transcript, and the result being filled in."""

    def __init__(self, sb: Sandbox, instance: SWEInstance, result: GradeResult):
        self.sb, self.inst, self.result, self.parts = sb, instance, result, []

    def step(self, name: str, cmd: str, timeout: float = STEP_TIMEOUT, env: dict | None = None):
        r = self.sb.exec(cmd, timeout=timeout, env=env, workdir=self.inst.workdir)
        self.parts.append(f"$ {name}: {cmd}\n{r.output}"
                          f"[exit {r.exit_code}{', timed out' if r.timed_out else ''}, {r.duration_s:.2f}s]\n")
        return r

    def fail(self, reason: str) -> GradeResult:
        self.result.status, self.result.reason = ERROR, reason
        return self.result

    def run(self, model_patch: str, timeout: float, partial_credit: bool, fail_fast: bool) -> GradeResult:
        inst = self.inst
        env, writes = {"BASE_COMMIT": inst.base_commit or "HEAD"}, []
        files = {MODEL_PATCH: model_patch if model_patch.endswith("\n") else model_patch + "\n",
                 **({EVAL_SCRIPT: inst.eval_script} if inst.eval_script is not None else {TEST_PATCH: inst.test_patch})}
        # fail_only counts an erroring verdict test as passing: a stop at it could change the verdict
        fail_fast = (fail_fast and not partial_credit and inst.log_parser in PYTEST_PARSERS
                     and inst.eval_type != "fail_only")
        if fail_fast:
            writes.append(f"mkdir -p {STOP_DIR}")
            files.update({f"{STOP_DIR}/roll_agent_stop.py": STOP_PLUGIN_SOURCE,
                          f"{STOP_DIR}/ids.txt": "".join(t + "\n" for t in inst.tests)})
        for k, (path, text) in enumerate(files.items()):
            # small files travel in the first command's environment: a separate upload
            # (docker put_archive) costs more than the whole command on a busy machine
            if len(text.encode()) <= INLINE_MAX:
                env[f"ROLL_AGENT_FILE{k}"] = text
                writes.append(f'printf "%s" "$ROLL_AGENT_FILE{k}" > {path}')
            else:
                self.sb.write_file(path, text)
        # one command writes the files, checks out base_commit and tries the first way to apply
        # the patch (each exec is a round trip to the sandbox: most patches take the first way)
        (first, first_cmd), *rest = APPLY_METHODS
        r = self.step(f"checkout base_commit, apply model patch ({first})", "; ".join([*writes, _CHECKOUT, first_cmd]),
                      env=env)
        if r.exit_code == CHECKOUT_FAILED or r.timed_out:
            return self.fail(f"malformed instance: cannot check out base_commit: {r.output.strip()[-300:]}")
        self.result.apply_method = first if r.ok else self.apply_fallbacks(rest)
        if not self.result.apply_method:
            return self.fail("patch does not apply (git apply, git apply --3way and patch --fuzz=5 all failed)")
        if inst.eval_script is None and inst.test_patch.strip():  # an eval_script applies it itself
            restore = "; ".join(f"if git cat-file -e HEAD:{q} 2>/dev/null; then git checkout -q HEAD -- {q}; "
                                f"else rm -rf -- {q}; fi" for q in map(shlex.quote, patch_files(inst.test_patch)))
            r = self.step("apply test_patch", f"{restore}; git apply --verbose {TEST_PATCH}")
            if not r.ok:
                return self.fail("malformed instance: test_patch does not apply after the model patch")
        r = self.run_tests(timeout, fail_fast)
        self.result.test_output = r.output
        if r.timed_out:
            return self.fail(f"timeout: the tests ran past {timeout:g}s")
        parse = get_parser(inst.log_parser, inst)
        try:
            if inst.eval_script is None:
                self.result.tests = parse(r.output)
            elif START_TEST_OUTPUT in r.output and END_TEST_OUTPUT in r.output:
                part = r.output.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
                self.result.tests = parse(part) or parse(r.output)  # as the harness: all of it if that names none
            else:
                self.result.reason = (f"the eval_script printed no '{START_TEST_OUTPUT}' / '{END_TEST_OUTPUT}' "
                                      "markers: no test output to read (the official harness grades it unresolved too)")
        except Exception as e:  # noqa: BLE001 - a user's (or the harness's) parser: this instance's error only
            return self.fail(f"log parser {inst.log_parser!r} failed on the test output: {type(e).__name__}: {e}")
        (self.result.status, self.result.reward, self.result.fail_to_pass,
         self.result.pass_to_pass) = verdict(inst, self.result.tests, partial_credit)
        if not self.result.tests:  # nothing ran (fail_only would call that a pass; the harness does not)
            self.result.status, self.result.reward = UNRESOLVED, 0.0
        if self.result.stopped_at:  # the failure lists say what failed, not what never ran
            for split in (self.result.fail_to_pass, self.result.pass_to_pass):
                self.result.not_run += [t for t in split["failure"] if t not in self.result.tests]
                split["failure"] = [t for t in split["failure"] if t in self.result.tests]
        return self.result

    def apply_fallbacks(self, methods) -> str:
        """The first of `methods` that applies the model patch; none: ALREADY_APPLIED when its
        reverse applies (as the official harness: the change is in the tree, the tests decide), else ""."""
        for name, cmd in methods:
            if self.step(f"apply model patch ({name})", cmd).ok:
                return name
        reverse = self.step("is the model patch already applied", f"git apply --check --reverse {MODEL_PATCH}")
        return ALREADY_APPLIED if reverse.ok else ""

    def run_tests(self, timeout: float, fail_fast: bool):
        if self.inst.eval_script is not None:
            cmd = f"bash {EVAL_SCRIPT}"  # as the harness runs its eval.sh
        else:
            cmd = self.inst.test_cmd or default_test_cmd(self.inst)
        if not fail_fast:
            return self.step("run tests", cmd, timeout=timeout)
        r = self.step("run tests (stop at the first failing FAIL_TO_PASS/PASS_TO_PASS test)", STOP_ENV + cmd,
                      timeout=timeout)
        if r.timed_out or LOADED in r.output:
            stop = re.search(f"^{re.escape(STOPPED)}(.+)$", r.output, re.M)
            self.result.stopped_at = stop.group(1).strip() if stop else ""
            return r
        # no pytest session took the plugin (the command ran no pytest, or pytest could not
        # load it): what that run printed is not known to match a plain run, so run it plain
        return self.step("run tests (again, without the stop plugin: it did not load)", cmd, timeout=timeout)


def grade(instance: SWEInstance, model_patch: str | None, sandbox: str | Sandbox = "docker",
          timeout: float = 1800.0, partial_credit: bool = False,
          sandbox_options: dict[str, Any] | None = None, fail_fast: bool = True) -> GradeResult:
    """Grade `model_patch` on `instance`; never raises for a bad patch, instance or sandbox.

    sandbox: a backend name ("docker" or "bwrap"; a fresh sandbox is made and closed),
    or a started sandbox from `prepare_sandbox(instance, ...)` that nothing else has
    used; the caller closes that one (so it can start sandboxes ahead of time, and
    close them off its critical path).
    sandbox_options: extra backend options (memory_mb, cpus, pool_size, ...).
    fail_fast: stop pytest at the first failing verdict test (same verdict; see step 4).
    """
    t0 = time.monotonic()
    result = GradeResult(instance.instance_id, ERROR)
    problem = instance_problem(instance, sandbox if isinstance(sandbox, str) else None)
    if problem or not (model_patch or "").strip():
        result.status, result.reason = ((ERROR, f"malformed instance: {problem}") if problem
                                        else (EMPTY_PATCH, "the model patch is empty"))
        return result
    try:
        sb = prepare_sandbox(instance, sandbox, sandbox_options) if isinstance(sandbox, str) else sandbox
    except InstanceError as e:  # the repo has no base_commit (bwrap source tree)
        result.reason = str(e)
        result.duration_s = time.monotonic() - t0
        return result
    except (SandboxError, OSError, ValueError, TypeError) as e:  # no image/source tree, bad options
        result.reason = f"sandbox could not start: {type(e).__name__}: {e}"
        result.duration_s = time.monotonic() - t0
        return result
    run = _Run(sb, instance, result)
    try:
        run.run(model_patch, timeout, partial_credit, fail_fast)
    except SandboxError as e:
        result.status, result.reason = ERROR, f"sandbox died: {e}"
    finally:
        if isinstance(sandbox, str):
            sb.close()
    result.log = "".join(run.parts)
    result.duration_s = time.monotonic() - t0
    return result
