"""Test-log parsers: a test run's output -> {test id: status}.

Parsers are looked up by the instance's `log_parser` name: a built-in one ("pytest",
"unittest"), one added with `register_parser(name, fn)`, "package.module:function"
for a parser that lives in the user's own code, or one of the official SWE-bench
harness's names (`parse_log_pytest`, `parse_log_django`, `parse_log_sympy`, ...: its
PARSER_REGISTRY, from the `swebench` package, the `swe` extra; imported on first use).
A parser is any function `str -> dict[str, str]` whose statuses are the names below;
the harness's take (log, test_spec) and are given one built from the instance.

The test ids must be spelled as the instance's FAIL_TO_PASS / PASS_TO_PASS spell them:
pytest node ids ("tests/test_x.py::test_y[param]") for "pytest", "test_y (module.Class)"
style for "unittest" (as SWE-bench's Django logs name them).
"""
from __future__ import annotations

import functools
import importlib
import re
from typing import Any, Callable

PASSED, FAILED, SKIPPED, ERROR, XFAIL, XPASS = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS"
STATUSES = (PASSED, FAILED, SKIPPED, ERROR, XFAIL, XPASS)
# xfail counts as passing: the suite declared that failure expected (SWE-bench does the same)
PASSING = frozenset({PASSED, XFAIL})
_BAD = frozenset({FAILED, ERROR})

Parser = Callable[[str], dict[str, str]]

# `-rA` summary ("PASSED tests/a.py::t", "FAILED tests/a.py::t - AssertionError ...")
_SUMMARY = re.compile(r"^(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S.*?)(?: - .*)?$")
# `-v` progress lines ("tests/a.py::t PASSED    [ 50%]")
_VERBOSE = re.compile(r"^(\S+::\S.*?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)(?:\s+\[\s*\d+%\])?\s*$")


def _record(results: dict[str, str], test: str, status: str) -> None:
    """A failure is never overwritten by a pass (a test that passed but errored in teardown failed)."""
    if results.get(test) in _BAD and status not in _BAD:
        return
    results[test] = status


def parse_pytest(log: str) -> dict[str, str]:
    """pytest run with `-rA` (summary lines) and/or `-v` (one line per test)."""
    results: dict[str, str] = {}
    for raw in log.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", raw).strip()  # colour codes, if --color=yes
        m = _SUMMARY.match(line)
        if m:
            status, test = m.group(1), m.group(2).strip()
            if status == SKIPPED and test.startswith("["):
                continue  # "SKIPPED [1] file.py:3: reason" names a location, not a test id
            _record(results, test, status)
            continue
        m = _VERBOSE.match(line)
        if m:
            _record(results, m.group(1), m.group(2))
    return results


_UNITTEST = re.compile(r"^(\w+) \(([\w.]+)\) \.\.\. (ok|FAIL|ERROR|skipped.*|expected failure|unexpected success)$")
_UNITTEST_STATUS = {"ok": PASSED, "FAIL": FAILED, "ERROR": ERROR, "expected failure": XFAIL,
                    "unexpected success": XPASS}


def parse_unittest(log: str) -> dict[str, str]:
    """`python -m unittest -v` / Django's runner at verbosity 2: "test_x (pkg.mod.Class) ... ok"."""
    results: dict[str, str] = {}
    for line in log.splitlines():
        m = _UNITTEST.match(line.strip())
        if m:
            word = m.group(3)
            status = SKIPPED if word.startswith("skipped") else _UNITTEST_STATUS[word]
            _record(results, f"{m.group(1)} ({m.group(2)})", status)
    return results


PARSERS: dict[str, Parser] = {"pytest": parse_pytest, "unittest": parse_unittest}
OFFICIAL_PREFIX = "parse_log_"  # the SWE-bench harness's parser names
# parsers of pytest's own output: the default test command and the stop plugin work with them
PYTEST_PARSERS = frozenset({"pytest", "parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2"})


@functools.cache
def official_parsers() -> dict[str, Callable[[str, Any], dict[str, str]]]:
    """The harness's PARSER_REGISTRY (its import takes ~1 s: datasets, docker, modal)."""
    try:
        from swebench.harness.log_parsers import PARSER_REGISTRY
    except ImportError as e:
        raise ValueError(f"the official SWE-bench log parsers need the swebench package: "
                         f"pip install 'roll_agent[swe]' ({e})") from None
    return PARSER_REGISTRY


def _official(name: str, instance: Any) -> Parser:
    parsers = official_parsers()
    if name not in parsers:
        raise ValueError(f"unknown log parser {name!r}; the official harness has: {', '.join(sorted(parsers))}")
    from swebench.types import TestSpec

    spec = TestSpec(instance_id=getattr(instance, "instance_id", ""), image=getattr(instance, "image", "") or "",
                    eval_script_list=[], repo=getattr(instance, "repo", ""), version=getattr(instance, "version", ""),
                    FAIL_TO_PASS=list(getattr(instance, "FAIL_TO_PASS", [])),
                    PASS_TO_PASS=list(getattr(instance, "PASS_TO_PASS", [])), log_parser=name,
                    eval_type=getattr(instance, "eval_type", "pass_and_fail"))
    fn = parsers[name]
    return lambda log: fn(log, spec)


def register_parser(name: str, fn: Parser) -> None:
    if name in PARSERS and PARSERS[name] is not fn:
        raise ValueError(f"a log parser named {name!r} is already registered")
    PARSERS[name] = fn


def get_parser(name: str, instance: Any = None) -> Parser:
    """A parser by name, or "module:function"; ValueError names the valid choices.
    `instance` (an SWEInstance): what the official harness's parsers are told about the
    instance (some read its repo version or id)."""
    if name in PARSERS:
        return PARSERS[name]
    if name.startswith(OFFICIAL_PREFIX):
        return _official(name, instance)
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"log parser {name!r} cannot be imported: {e}") from None
        if not callable(fn):
            raise ValueError(f"log parser {name!r} is not callable")
        return fn
    raise ValueError(f"unknown log parser {name!r}; valid: {', '.join(sorted(PARSERS))}, "
                     f"an official harness name ({OFFICIAL_PREFIX}pytest, ...) or 'module:function'")
