"""SWE task instances (SWE-bench schema) and their loaders.

One JSONL object per line. SWE-bench and SWE-Gym share the schema below. SWE-smith
names the image `image_name` and has no `base_commit`: grading then uses the image's
checkout as it is, so the image must hold the task's buggy tree (SWE-smith's own
images hold the clean repo and its harness checks out a branch per instance: give
that branch's commit as base_commit, or build an image at it). SWE-bench 5.x rows
carry `image`, `eval_script`, `log_parser` (an official name, `parse_log_pytest`, ...)
and `eval_type`; roll_agent reads them, and adds optional `workdir`, `test_cmd` and
its own `log_parser` names (see SWEInstance).

Bad input ends only that line's instance: `load_instances(..., errors="collect")`
returns the good instances and a list of MalformedInstance records naming the line
and the field, so an evaluation can count them as errors and go on.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable

FORMATS = ("auto", "swe-bench", "swe-gym", "swe-smith")
DEFAULT_WORKDIR = "/testbed"
_REQUIRED = ("instance_id", "FAIL_TO_PASS", "PASS_TO_PASS")


class InstanceError(ValueError):
    """An instance (or prediction) line that cannot be used; the message names line and field."""


@dataclasses.dataclass
class SWEInstance:
    instance_id: str
    repo: str = ""
    base_commit: str = ""  # "" (SWE-smith): the image's checkout as it is
    patch: str = ""  # the gold fix, a unified diff
    test_patch: str = ""  # applied after the model patch, before the tests run
    problem_statement: str = ""
    hints_text: str = ""
    created_at: str = ""
    version: str = ""
    environment_setup_commit: str = ""
    FAIL_TO_PASS: list[str] = dataclasses.field(default_factory=list)
    PASS_TO_PASS: list[str] = dataclasses.field(default_factory=list)
    # roll_agent extras
    image: str | None = None  # local docker image with the repo at base_commit in workdir
    workdir: str = DEFAULT_WORKDIR
    test_cmd: str | None = None  # run in workdir after the patches; prints what log_parser reads
    log_parser: str = "pytest"  # envs/swe/log_parsers.py: ours, or the official harness's parse_log_*
    # SWE-bench 5.x: the harness's eval.sh (resets the test files, applies test_patch, runs
    # the tests between its ">>>>> Start/End Test Output" markers); replaces test_patch + test_cmd
    eval_script: str | None = None
    eval_type: str = "pass_and_fail"  # or "fail_only": a verdict test passes unless the log says it failed
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # fields of other schemas, kept as is

    @property
    def tests(self) -> list[str]:
        """Every test the verdict looks at (FAIL_TO_PASS then PASS_TO_PASS)."""
        return [*self.FAIL_TO_PASS, *self.PASS_TO_PASS]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        extra = d.pop("extra")
        return {**extra, **d}


_FIELDS = {f.name for f in dataclasses.fields(SWEInstance)} - {"extra"}
EVAL_TYPES = ("pass_and_fail", "fail_only")
_NULLABLE = ("image", "test_cmd", "eval_script")


def _test_list(value: Any, field: str) -> list[str]:
    """A list of test ids; SWE-bench dumps store it as a JSON-encoded string."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise InstanceError(f"field {field!r} is a string but not a JSON list of test ids ({e})") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise InstanceError(f"field {field!r} must be a list of test id strings, got {type(value).__name__}")
    return list(value)


def instance_from_dict(row: dict[str, Any], fmt: str = "auto") -> SWEInstance:
    """One instance from one JSON object; InstanceError names the bad field."""
    if not isinstance(row, dict):
        raise InstanceError(f"expected a JSON object, got {type(row).__name__}")
    if fmt not in FORMATS:
        raise InstanceError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    row = dict(row)
    if fmt == "swe-smith" or (fmt == "auto" and "image_name" in row and "base_commit" not in row):
        if "image_name" in row and "image" not in row:
            row["image"] = row.pop("image_name")
    missing = [f for f in _REQUIRED if f not in row]
    if missing:
        raise InstanceError(f"missing required field(s) {missing}")
    if fmt in ("swe-bench", "swe-gym") and "base_commit" not in row:
        raise InstanceError(f"missing required field 'base_commit' ({fmt} format)")
    kwargs: dict[str, Any] = {}
    for name in _FIELDS & row.keys():
        value = row[name]
        if name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            value = _test_list(value, name)
        elif value is None and name in _NULLABLE:
            pass
        elif value is None:
            value = ""  # SWE-bench dumps carry nulls for absent hints/versions
        elif not isinstance(value, str):
            raise InstanceError(f"field {name!r} must be a string, got {type(value).__name__}")
        kwargs[name] = value
    if not kwargs["instance_id"]:
        raise InstanceError("field 'instance_id' is empty")
    for name in ("log_parser", "eval_type"):  # null or "": the default
        if kwargs.get(name) == "":
            del kwargs[name]
    if kwargs.get("eval_type", EVAL_TYPES[0]) not in EVAL_TYPES:
        raise InstanceError(f"field 'eval_type' must be one of {', '.join(EVAL_TYPES)}, got {kwargs['eval_type']!r}")
    if not kwargs.get("workdir", DEFAULT_WORKDIR).startswith("/"):
        raise InstanceError(f"field 'workdir' must be an absolute path, got {kwargs['workdir']!r}")
    extra = {k: v for k, v in row.items() if k not in _FIELDS}
    return SWEInstance(**kwargs, extra=extra)


@dataclasses.dataclass
class MalformedInstance:
    """A dataset line that could not be loaded: graded as an error, never silently dropped."""
    instance_id: str  # the id when the line had one, else "<file>:<line>"
    reason: str


def _lines(path: str | Path) -> Iterable[tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                yield i, line


def load_instances(path: str | Path, fmt: str = "auto", errors: str = "raise"
                   ) -> list[SWEInstance] | tuple[list[SWEInstance], list[MalformedInstance]]:
    """Instances from a JSONL file (SWE-bench / SWE-Gym / SWE-smith; `fmt` or "auto").

    errors="raise": the first bad line raises InstanceError naming file, line and field.
    errors="collect": returns (instances, malformed) and keeps going.
    """
    if errors not in ("raise", "collect"):
        raise ValueError(f"errors must be 'raise' or 'collect', got {errors!r}")
    good, bad, seen = [], [], set()
    for lineno, line in _lines(path):
        where = f"{path}:{lineno}"
        row: Any = None
        try:
            row = json.loads(line)
            inst = instance_from_dict(row, fmt)
            if inst.instance_id in seen:
                raise InstanceError(f"duplicate instance_id {inst.instance_id!r}")
            seen.add(inst.instance_id)
            good.append(inst)
        except (json.JSONDecodeError, InstanceError) as e:
            msg = f"{where}: {e}" + ("" if isinstance(e, InstanceError) else " (not valid JSON)")
            if errors == "raise":
                raise InstanceError(msg) from None
            iid = row.get("instance_id") if isinstance(row, dict) else None
            bad.append(MalformedInstance(iid if isinstance(iid, str) and iid and iid not in seen else where, msg))
    return (good, bad) if errors == "collect" else good


def load_predictions(path: str | Path) -> dict[str, dict[str, Any]]:
    """SWE-bench predictions JSONL (instance_id, model_name_or_path, model_patch) -> {id: row}.

    A JSON list of the same objects is accepted too (SWE-bench writes both). A null
    model_patch is an empty patch; a missing one is an error naming the line.
    """
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = list(enumerate(json.loads(text), 1))
    else:
        rows = []
        for lineno, line in _lines(path):
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                raise InstanceError(f"{path}:{lineno}: not valid JSON ({e})") from None
    out: dict[str, dict[str, Any]] = {}
    for lineno, row in rows:
        where = f"{path}:{lineno}"
        if not isinstance(row, dict) or not isinstance(row.get("instance_id"), str):
            raise InstanceError(f"{where}: a prediction needs a string 'instance_id'")
        if "model_patch" not in row:
            raise InstanceError(f"{where}: prediction {row['instance_id']!r} has no 'model_patch' field")
        patch = row["model_patch"]
        if patch is not None and not isinstance(patch, str):
            raise InstanceError(f"{where}: 'model_patch' must be a string or null")
        if row["instance_id"] in out:
            raise InstanceError(f"{where}: duplicate prediction for {row['instance_id']!r}")
        out[row["instance_id"]] = {**row, "model_patch": patch or ""}
    return out


def gold_predictions(instances: Iterable[SWEInstance], model_name: str = "gold") -> dict[str, dict[str, Any]]:
    """`--predictions gold`: every instance's own fix as its prediction."""
    return {i.instance_id: {"instance_id": i.instance_id, "model_name_or_path": model_name, "model_patch": i.patch}
            for i in instances}


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
