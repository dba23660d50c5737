"""SWE tasks: SWE-bench-schema instances, their grading in sandboxes, the SWE env.

    from envs.swe import load_instances, grade
    for inst in load_instances("tasks.jsonl"):
        r = grade(inst, inst.patch, sandbox="docker")   # r.status == "resolved"

Modules: instance (schema, loaders), grading (grade -> GradeResult), log_parsers
(test-log parsers by name). Importing this package imports no sandbox code.
"""
from __future__ import annotations

from .instance import (InstanceError, MalformedInstance, SWEInstance, gold_predictions, instance_from_dict,
                       load_instances, load_predictions, write_jsonl)

__all__ = ["SWEInstance", "InstanceError", "MalformedInstance", "instance_from_dict", "load_instances",
           "load_predictions", "gold_predictions", "write_jsonl", "grade", "GradeResult"]


def __getattr__(name: str):
    # grading pulls in the sandbox layer; only when someone grades
    if name in ("grade", "GradeResult"):
        from . import grading

        return getattr(grading, name)
    raise AttributeError(f"module 'envs.swe' has no attribute {name!r}")
